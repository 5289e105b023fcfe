"""A service's link to the controller: registration, the topics it watches, commands,
and heartbeats (:class:`ControllerLink`, a mixin of :class:`~tianji.runtime.service.Service`),
and the counters every service reports (:class:`ServiceStat`)."""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import resource
import socket
import time
from typing import Any, ClassVar, Final, Protocol

from tianji.runtime import plugins
from tianji.runtime.core import Connection
from tianji.runtime.errors import HandshakeRefused, TianjiError
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

__all__ = ["CONTROL", "ControllerLink", "ServiceStat", "memory_gauges"]

log = logging.getLogger("tianji.service")

CONTROL = ""
"""The topic of requests and replies on a link and to the controller (not pub/sub)."""
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


class _Linked(Protocol):
    """What the controller link uses of the service (see :class:`Service`)."""

    name: str
    role: ClassVar[str]
    address: str
    local_address: str
    locality: str
    run_digest: str
    run_id: str
    controller_address: str | None
    options: Any
    counters: collections.Counter[str]
    _publishes: set[str]
    _handlers: dict[str, list[Any]]
    _controller_conn: Connection | None
    _registered: asyncio.Event
    _watch_pending: set[str]
    _stopping: asyncio.Event
    _report_wanted: asyncio.Event

    def _frames(self, ev: Event, topic_name: str) -> list[bytes | bytearray | memoryview]: ...

    def _decode(self, frames: list[memoryview], peer: str) -> tuple[str, Event]: ...

    def _registration(self: _Linked) -> RegisterService: ...

    async def _on_controller_event(self: _Linked, ev: Event) -> None: ...

    def _set_publishers(self, name: str, addresses: Any) -> None: ...

    def _check_ready(self) -> None: ...

    def fail(self, reason: str) -> None: ...

    def stop(self, reason: str) -> None: ...

    async def on_control(self, ev: Event) -> None: ...

    def heartbeat(self) -> Heartbeat: ...


class ControllerLink:
    """Registration with the controller (again after the link breaks), the topics the
    service watches, the controller's commands, and heartbeats: every
    ``heartbeat_interval`` and soon after :meth:`report_soon`."""

    # set by the service's __init__, assigned here too
    _controller_conn: Connection | None
    _watch_pending: set[str]
    run_id: str

    def _registration(self: _Linked) -> RegisterService:
        return RegisterService(
            name=self.name,
            role=self.role,
            address=self.address,
            publishes=tuple(sorted(self._publishes)),
            host=socket.gethostname(),
            pid=os.getpid(),
            local_address=self.local_address,
            locality=self.locality,
            run_digest=self.run_digest,
        )

    async def _controller_loop(self: _Linked) -> None:
        assert self.controller_address is not None
        transport = plugins.transport_for(self.controller_address)
        delay = self.options.reconnect_min
        lost_at = time.monotonic()
        refusals = 0
        while True:
            try:
                conn = await transport.connect(self.controller_address, limits=self.options.limits)
            except HandshakeRefused as exc:
                refusals += 1
                log.warning("%s: the controller refused the handshake: %s", self.name, str(exc))
                if refusals >= HANDSHAKE_REFUSALS:
                    self.stop(
                        f"refused: the controller at {self.controller_address} refused the "
                        f"handshake {refusals} times in a row ({exc.reason}); likely cause: "
                        f"{exc.hint}"
                    )
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.options.reconnect_max)
                continue
            except (TianjiError, OSError) as exc:
                refusals = 0
                if time.monotonic() - lost_at > self.options.controller_grace:
                    self.fail(f"controller {self.controller_address} unreachable: {exc}")
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.options.reconnect_max)
                continue
            self._controller_conn = conn
            try:
                await conn.send(self._frames(self._registration(), CONTROL))
                self._watch_pending = set(self._handlers)
                await conn.send(self._frames(WatchTopics(topics=tuple(self._handlers)), CONTROL))
                delay = self.options.reconnect_min
                while True:
                    _, ev = self._decode(await conn.recv(), conn.peer)
                    await self._on_controller_event(ev)
            except TianjiError as exc:
                if self._stopping.is_set():
                    return
                log.warning("%s: controller link lost: %s", self.name, str(exc))
            finally:
                self._controller_conn = None
                conn.abort()
            lost_at = time.monotonic()
            self._registered.clear()

    async def _on_controller_event(self: _Linked, ev: Event) -> None:
        if isinstance(ev, PublishersChanged):
            self._set_publishers(ev.topic, ev.addresses)
            self._watch_pending.discard(ev.topic)
            self._check_ready()
        elif isinstance(ev, ServiceRegistered):
            self.run_id = ev.run_id
            self._registered.set()
            self._check_ready()
        elif isinstance(ev, Shutdown):
            self.stop(ev.reason)
        else:
            await self.on_control(ev)

    def report_soon(self: _Linked) -> None:
        """Send a heartbeat as soon as ``options.report_interval`` allows (not only every
        ``heartbeat_interval``): services call it when counters the controller balances on
        have changed, so its decisions follow the run closely."""
        self._report_wanted.set()

    async def _heartbeat_loop(self: _Linked) -> None:
        last = 0.0
        loop = asyncio.get_running_loop()
        while True:
            await wait_set(self._report_wanted, self.options.heartbeat_interval)
            gap = self.options.report_interval - (loop.time() - last)
            if gap > 0:
                await asyncio.sleep(gap)
            self._report_wanted.clear()
            last = loop.time()
            conn = self._controller_conn
            if conn is None:
                continue
            try:
                conn.send_nowait(self._frames(self.heartbeat(), CONTROL))
                self.counters["heartbeats_sent"] += 1
            except TianjiError:
                # The link is full (or breaking): try again after report_interval rather than
                # a whole heartbeat_interval later; the controller balances on these reports.
                self.counters["heartbeats_skipped"] += 1
                self._report_wanted.set()
