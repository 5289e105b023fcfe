"""Where a service's heartbeats go: to its node's heartbeat aggregator when the controller
names one, else straight to the controller (:class:`HeartbeatRoute`, owned by the
service's :class:`~tianji.runtime.heartbeats.ControllerLink`).

An aggregator (:class:`~tianji.runtime.aggregator.HeartbeatAggregator`, role
:data:`AGGREGATOR_ROLE`) publishes the pseudo-topic :data:`HEARTBEATS_TOPIC`; every other
service watches it, and the controller tells each the aggregator of its own locality
(none where its node has none). The route keeps one connection to that aggregator (opened
in the background, reopened after a back-off when it breaks) and the heartbeat loop sends
on it while it is up; it sends to the controller while it is not. Registration, commands
and the service's death (its control link closing) stay on the control link.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Final

from tianji.runtime import plugins
from tianji.runtime.core import Connection
from tianji.runtime.errors import TianjiError
from tianji.runtime.loop import first_done
from tianji.runtime.wiring import FrameList, ServiceOptions

__all__ = [
    "AGGREGATOR_ROLE",
    "DEFAULT_FLUSH_INTERVAL",
    "HEARTBEATS_TOPIC",
    "HeartbeatRoute",
    "RouteStat",
]

log = logging.getLogger("tianji.service")

AGGREGATOR_ROLE: Final = "aggregator"
"""Services of this role batch the heartbeats of the services of their locality (one per
node) and send the controller one :class:`~tianji.runtime.events.HeartbeatBatch` per flush."""
HEARTBEATS_TOPIC: Final = "_heartbeats"
"""The pseudo-topic an aggregator publishes: a service that watches it is told the
address of its locality's aggregator (no events travel on it)."""
DEFAULT_FLUSH_INTERVAL: Final = 0.04
"""Seconds between an aggregator's flush ticks (the most a heartbeat waits there). Every
tick costs the controller a decision and one message per node: 25 a second at 0.04 s
(``docs/scaling.md``)."""
UNROUTED_ROLES: Final = frozenset({AGGREGATOR_ROLE, "controller"})
"""Roles whose heartbeats always go straight to the controller."""


class RouteStat:
    """The counters of a service's heartbeat route (reported in its heartbeats)."""

    VIA_AGGREGATOR: Final = "heartbeats_via_aggregator"
    """Heartbeats sent to the node's aggregator."""
    DIRECT: Final = "heartbeats_direct"
    """Heartbeats sent straight to the controller while an aggregator was named but not
    reachable (connecting, failed, or backing off)."""
    LINK_FAILURES: Final = "aggregator_link_failures"
    """Connects to the aggregator that failed and links to it that broke."""


class HeartbeatRoute:
    """The link to the node's aggregator, if the controller named one.

    Args:
        name: the owning service's name (for logs).
        options: the service's options (limits, reconnect delays).
        counters: the service's counters (see :class:`RouteStat`).
    """

    def __init__(
        self, name: str, options: ServiceOptions, counters: collections.Counter[str]
    ) -> None:
        self.name = name
        self.options = options
        self.counters = counters
        self.address: str | None = None  # the aggregator the controller named
        self.conn: Connection | None = None  # the link to it, while up
        self._changed = asyncio.Event()

    def set_publishers(self, addresses: tuple[str, ...] | list[str]) -> None:
        """The controller's list for :data:`HEARTBEATS_TOPIC` (at most one address)."""
        address = addresses[0] if addresses else None
        if address != self.address:
            self.address = address
            self._changed.set()

    def send(self, frames: FrameList) -> bool:
        """Send a heartbeat's message to the aggregator; False (counted as direct) when
        there is no link up to it, or sending failed (the link is then dropped and
        opened again after a back-off)."""
        conn = self.conn
        if conn is None:
            if self.address is not None:
                self.counters[RouteStat.DIRECT] += 1
            return False
        try:
            conn.send_nowait(frames)
        except TianjiError as exc:
            self.counters[RouteStat.LINK_FAILURES] += 1
            self.counters[RouteStat.DIRECT] += 1
            log.info("%s: heartbeat to aggregator %s failed: %s", self.name, conn.peer, exc)
            self.conn = None
            conn.abort()  # its reader ends, backs off and connects again
            return False
        self.counters[RouteStat.VIA_AGGREGATOR] += 1
        return True

    async def run(self) -> None:
        """Keep a link to the named aggregator, following the controller's changes."""
        try:
            while True:
                self._changed.clear()
                address = self.address
                if address is None:
                    await self._changed.wait()
                    continue
                await first_done(self._keep(address), self._changed.wait())
                self._drop()
        finally:
            self._drop()

    def _drop(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.abort()

    async def _keep(self, address: str) -> None:
        """Connect to ``address``, read until the link ends, back off, again."""
        delay = self.options.reconnect_min
        transport = plugins.transport_for(address)
        while True:
            try:
                conn = await transport.connect(address, limits=self.options.limits)
            except (TianjiError, OSError) as exc:
                self.counters[RouteStat.LINK_FAILURES] += 1
                log.info("%s: cannot reach aggregator %s: %s", self.name, address, exc)
            else:
                self.conn = conn
                delay = self.options.reconnect_min
                try:
                    while True:  # the aggregator sends nothing; this sees the link end
                        await conn.recv()
                except TianjiError as exc:
                    if self.conn is conn:  # not already counted by a failed send
                        self.counters[RouteStat.LINK_FAILURES] += 1
                    log.info("%s: aggregator link %s ended: %s", self.name, address, exc)
                finally:
                    self._drop()
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.options.reconnect_max)
