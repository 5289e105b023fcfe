"""A service's link to the controller: registration, the topics it watches, commands,
and heartbeats (:class:`ControllerLink`, owned by :class:`~tianji.runtime.service.Service`),
and the counters every service reports (:class:`ServiceStat`)."""

from __future__ import annotations

import asyncio
import collections
import logging
import resource
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Final

from tianji.runtime import plugins
from tianji.runtime.aggregation import HEARTBEATS_TOPIC, UNROUTED_ROLES, HeartbeatRoute
from tianji.runtime.core import Connection
from tianji.runtime.errors import HandshakeRefused, ServiceFailed, TianjiError
from tianji.runtime.events import (
    Event,
    Heartbeat,
    PublishersChanged,
    RegisterService,
    ServiceRegistered,
    Shutdown,
    WatchTopics,
)
from tianji.runtime.loop import wait_set
from tianji.runtime.wiring import CONTROL, Decode, Encode, ServiceOptions

__all__ = ["ControllerLink", "ServiceStat", "memory_gauges"]

log = logging.getLogger("tianji.service")

HANDSHAKE_REFUSALS = 3
"""Handshakes the controller refuses in a row before a service stops as refused (a wrong
token or TLS setting does not fix itself; the ``tianji serve`` process then exits 2)."""


class ServiceStat:
    """The counters and gauges every service reports, read by others (the launcher's
    progress line, the run summary): declared here once (``tests/test_stats_contract.py``);
    the RL roles' own are in :mod:`tianji.rl.stats`."""

    RECEIVED: Final = "received"
    """Events received from publishers and on links."""
    PUBLISHED: Final = "published"
    """Events sent to subscribers."""
    PUBLISHED_BYTES: Final = "published_bytes"
    """Bytes of the events published, once per subscriber they went to (what the service
    put on its links), an event shared on the board once (:mod:`tianji.runtime.sharing`)."""
    BOARD_WRITES: Final = "board_writes"
    """Events written on this service's shared-memory board (one per event, for all the
    subscribers on its host)."""
    BOARD_READS: Final = "board_reads"
    """Events received through a publisher's board."""
    BOARD_SUPERSEDED: Final = "board_superseded"
    """Board references whose slot held a newer event when they arrived (skipped: the newer
    one follows)."""
    RSS_MB: Final = "rss_mb"
    MAX_RSS_MB: Final = "max_rss_mb"


def memory_gauges() -> dict[str, float]:
    """This process's resident memory now and at its peak, in MiB: ``VmRSS`` and ``VmHWM``
    of /proc/self/status (Linux; ``ru_maxrss`` elsewhere, which after a fork + exec may
    still hold the parent's peak)."""
    try:
        with open("/proc/self/status", "rb") as f:
            fields = dict(line.split(b":", 1) for line in f.read().splitlines() if b":" in line)
        now = int(fields[b"VmRSS"].split()[0]) / 1024
        peak = int(fields[b"VmHWM"].split()[0]) / 1024
    except (OSError, KeyError, ValueError) as exc:  # not Linux
        log.debug("no /proc/self/status (%r): ru_maxrss", exc)
        peak = now = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {ServiceStat.RSS_MB: round(now, 1), ServiceStat.MAX_RSS_MB: round(peak, 1)}


class ControllerLink:
    """Registration with the controller (again after the link breaks), the topics the
    service watches, the controller's commands, and heartbeats: every
    ``heartbeat_interval`` and soon after :meth:`report_soon`, through the node's
    heartbeat aggregator when the controller names one (:attr:`route`), else straight to
    the controller; the last one (:meth:`goodbye`) always straight to the controller.

    Args:
        name: the owning service's name.
        address: the controller's address.
        options: the service's options (limits, reconnect delays, heartbeat timing).
        counters: the service's counters (heartbeats sent and skipped).
        encode, decode: a service message to and from its frames.
        registration: the service's ``RegisterService`` now.
        watched: the topics the service subscribes to now.
        heartbeat: the service's heartbeat now.
        on_registered: called with the controller's :class:`ServiceRegistered`.
        on_publishers: called with a topic and its publishers' addresses.
        on_command: called with every other controller event.
        stop, fail: stop the service (refused handshakes), fail it (controller unreachable).
        stopping: whether the service is stopping (a lost link is then not reported).
    """

    def __init__(
        self,
        name: str,
        address: str | None,
        options: ServiceOptions,
        counters: collections.Counter[str],
        *,
        encode: Encode,
        decode: Decode,
        registration: Callable[[], RegisterService],
        watched: Callable[[], Collection[str]],
        heartbeat: Callable[[], Heartbeat],
        on_registered: Callable[[ServiceRegistered], None],
        on_publishers: Callable[[str, Sequence[str]], None],
        on_command: Callable[[Event], Awaitable[None]],
        stop: Callable[[str], None],
        fail: Callable[[str], None],
        stopping: Callable[[], bool],
    ) -> None:
        self.name = name
        self.address = address
        self.options = options
        self.counters = counters
        self.conn: Connection | None = None
        self.registered = asyncio.Event()
        self.watch_pending: set[str] = set()  # watched topics whose publishers are unknown
        self._report_wanted = asyncio.Event()
        self._delay = options.reconnect_min  # before the next connect, after one failed
        self.route = HeartbeatRoute(name, options, counters)
        self._encode = encode
        self._decode = decode
        self._registration = registration
        self._watched = watched
        self._heartbeat = heartbeat
        self._on_registered = on_registered
        self._on_publishers = on_publishers
        self._on_command = on_command
        self._stop = stop
        self._fail = fail
        self._stopping = stopping

    def complete(self) -> bool:
        """Registered, and the publishers of every watched topic known."""
        return self.registered.is_set() and not self.watch_pending

    def registered_conn(self) -> Connection | None:
        """The link, if it is up and the service registered on it (else a request now
        would be sent again on reconnecting anyway)."""
        return self.conn if self.registered.is_set() else None

    async def send(self, ev: Event) -> None:
        """Send a request or report to the controller.

        Raises:
            ServiceFailed: if there is no link to the controller now.
            TianjiError: if sending fails.
        """
        conn = self.conn
        if conn is None:
            raise ServiceFailed(self.name, f"no controller link to send {ev.TYPE}")
        await conn.send(self._encode(ev, CONTROL))

    async def goodbye(self) -> None:
        """Send the last heartbeat (the controller's books get the last counts), close."""
        conn = self.conn
        if conn is None:
            return
        self.conn = None  # no heartbeat after the last (nor through the aggregator)
        try:
            await conn.send(self._encode(self._heartbeat(), CONTROL))
            await asyncio.wait_for(conn.aclose(), 2.0)
        except (TianjiError, TimeoutError) as exc:
            log.info("%s: last heartbeat or goodbye to the controller: %r", self.name, exc)
            conn.abort()

    async def run(self) -> None:
        """Keep the link up: connect, register, watch, handle the controller's events."""
        assert self.address is not None
        transport = plugins.transport_for(self.address)
        self._delay = self.options.reconnect_min
        lost_at = time.monotonic()
        refusals = 0
        while True:
            try:
                conn = await transport.connect(self.address, limits=self.options.limits)
            except HandshakeRefused as exc:
                refusals += 1
                log.warning("%s: the controller refused the handshake: %s", self.name, str(exc))
                if refusals >= HANDSHAKE_REFUSALS:
                    self._stop(
                        f"refused: the controller at {self.address} refused the "
                        f"handshake {refusals} times in a row ({exc.reason}); likely cause: "
                        f"{exc.hint}"
                    )
                    return
                await self._back_off()
                continue
            except (TianjiError, OSError) as exc:
                refusals = 0
                if time.monotonic() - lost_at > self.options.controller_grace:
                    self._fail(f"controller {self.address} unreachable: {exc}")
                    return
                await self._back_off()
                continue
            if await self._serve(conn):
                return
            lost_at = time.monotonic()
            self.registered.clear()

    async def _back_off(self) -> None:
        await asyncio.sleep(self._delay)
        self._delay = min(self._delay * 2, self.options.reconnect_max)

    async def _serve(self, conn: Connection) -> bool:
        """Register on ``conn`` and handle what the controller sends until the link ends;
        True if it ended because the service is stopping."""
        self.conn = conn
        try:
            registration = self._registration()
            await conn.send(self._encode(registration, CONTROL))
            watched = tuple(self._watched())
            self.watch_pending = set(watched)
            if registration.role not in UNROUTED_ROLES:  # (readiness does not wait for it)
                watched = (*watched, HEARTBEATS_TOPIC)  # told its node's aggregator
            await conn.send(self._encode(WatchTopics(topics=watched), CONTROL))
            self._delay = self.options.reconnect_min
            while True:
                _, ev = self._decode(await conn.recv(), conn.peer)
                await self._on_event(ev)
        except TianjiError as exc:
            if self._stopping():
                return True
            log.warning("%s: controller link lost: %s", self.name, str(exc))
        finally:
            self.conn = None
            conn.abort()
        return False

    async def _on_event(self, ev: Event) -> None:
        if isinstance(ev, PublishersChanged):
            if ev.topic == HEARTBEATS_TOPIC:
                self.route.set_publishers(ev.addresses)
            else:
                self.watch_pending.discard(ev.topic)
                self._on_publishers(ev.topic, ev.addresses)
        elif isinstance(ev, ServiceRegistered):
            self.registered.set()
            self._on_registered(ev)
        elif isinstance(ev, Shutdown):
            self._stop(ev.reason)
        else:
            await self._on_command(ev)

    def report_soon(self) -> None:
        """Send a heartbeat as soon as ``options.report_interval`` allows (not only every
        ``heartbeat_interval``)."""
        self._report_wanted.set()

    async def heartbeats(self) -> None:
        """Send a heartbeat every ``heartbeat_interval`` and soon after :meth:`report_soon`
        (keeping the link to the node's aggregator, if any, meanwhile)."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.route.run())
            await self._beat()

    async def _beat(self) -> None:
        last = 0.0
        loop = asyncio.get_running_loop()
        while True:
            await wait_set(self._report_wanted, self.options.heartbeat_interval)
            gap = self.options.report_interval - (loop.time() - last)
            if gap > 0:
                await asyncio.sleep(gap)
            self._report_wanted.clear()
            last = loop.time()
            conn = self.conn
            if conn is None:
                continue
            try:
                frames = self._encode(self._heartbeat(), CONTROL)
                if not self.route.send(frames):
                    conn.send_nowait(frames)
                self.counters["heartbeats_sent"] += 1
            except TianjiError:
                # The link is full (or breaking): try again after report_interval rather than
                # a whole heartbeat_interval later; the controller balances on these reports.
                self.counters["heartbeats_skipped"] += 1
                self._report_wanted.set()
