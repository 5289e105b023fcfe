"""The controller's control plane: registry of services and the topics they publish.

Services register their listening address and published topics; subscribers watch
topics and are told the publishers' addresses now and on every change, then connect to
the publishers directly (bulk data never passes through the controller). The controller
also keeps each service's latest heartbeat, collects reports and broadcasts commands.

Usage::

    controller = Controller(bind="tcp://127.0.0.1:0")
    task = asyncio.create_task(controller.run())
    await controller.wait_ready()
    ...                                   # start services with controller=controller.address
    await controller.wait_until(lambda c: len(c.registry) == 3, timeout=30)
    await controller.shutdown_all("done")
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from tianji.core import Connection
from tianji.errors import TianjiError
from tianji.events import (
    Event,
    Heartbeat,
    PublishersChanged,
    RegisterService,
    ServiceRegistered,
    ServiceReported,
    Shutdown,
    WatchTopics,
)
from tianji.service import CONTROL, Service

__all__ = ["Controller", "ServiceRecord"]

log = logging.getLogger("tianji.controller")


@dataclasses.dataclass(slots=True)
class ServiceRecord:
    """What the controller knows about one registered service."""

    name: str
    role: str
    address: str
    publishes: tuple[str, ...]
    host: str
    pid: int
    conn: Connection
    registered_at: float
    last_heartbeat: Heartbeat | None = None
    last_seen: float = 0.0


class Controller(Service):
    """Registry, heartbeats, reports and commands; see the module docstring.

    Args:
        name: the controller's service name.
        run_id: identifies the run; generated when omitted.
        kwargs: passed to :class:`~tianji.service.Service` (``bind``, ``options``).
    """

    role = "controller"

    def __init__(self, name: str = "controller", *, run_id: str | None = None, **kwargs: Any):
        super().__init__(name, **kwargs)
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.registry: dict[str, ServiceRecord] = {}
        self.reports: dict[str, ServiceReported] = {}
        self.heartbeats: dict[str, Heartbeat] = {}  # latest per service, kept after it leaves
        self._watchers: dict[str, set[Connection]] = {}

    # ------------------------------------------------------------------ queries
    def publishers(self, topic_name: str) -> tuple[str, ...]:
        """Addresses of the services that publish ``topic_name``, sorted."""
        return tuple(sorted(r.address for r in self.registry.values() if topic_name in r.publishes))

    async def wait_until(
        self, predicate: Callable[[Controller], bool], timeout: float | None = None
    ) -> None:
        """Wait until ``predicate(self)`` holds; re-checked on every registry change.

        Raises:
            TimeoutError: if it does not hold within ``timeout`` seconds.
        """

        async def wait() -> None:
            while not predicate(self):
                await self._wait_changed()

        await asyncio.wait_for(wait(), timeout)

    async def broadcast(self, ev: Event) -> int:
        """Send a command to every registered service; returns how many got it."""
        frames = self._frames(ev, CONTROL)
        sent = 0
        for record in list(self.registry.values()):
            try:
                await record.conn.send(frames)
                sent += 1
            except TianjiError as exc:
                log.warning("cannot send %s to %s: %s", ev.TYPE, record.name, exc)
        return sent

    async def shutdown_all(self, reason: str) -> int:
        """Tell every registered service to drain and stop."""
        return await self.broadcast(Shutdown(reason=reason))

    # ------------------------------------------------------------------ requests
    async def on_request(self, ev: Event, conn: Connection) -> None:
        if isinstance(ev, RegisterService):
            await self._register(ev, conn)
        elif isinstance(ev, WatchTopics):
            for name in ev.topics:
                self._watchers.setdefault(name, set()).add(conn)
                await self._tell(
                    conn, PublishersChanged(topic=name, addresses=self.publishers(name))
                )
        elif isinstance(ev, Heartbeat):
            record = self.registry.get(ev.name)
            if record is not None and record.conn is conn:
                self.heartbeats[ev.name] = ev
                record.last_heartbeat = ev
                record.last_seen = time.monotonic()
                self._notify()
        elif isinstance(ev, ServiceReported):
            self.reports[ev.name] = ev
            log.info("%s reported %s: %s", ev.name, ev.status, ev.summary)
            self._notify()
        else:
            await super().on_request(ev, conn)

    async def _register(self, ev: RegisterService, conn: Connection) -> None:
        old = self.registry.get(ev.name)
        if old is not None and old.conn is not conn:
            log.warning(
                "%s registered again from %s; replacing %s", ev.name, ev.address, old.address
            )
        before = set(old.publishes) if old is not None else set()
        now = time.monotonic()
        self.registry[ev.name] = ServiceRecord(
            name=ev.name,
            role=ev.role,
            address=ev.address,
            publishes=ev.publishes,
            host=ev.host,
            pid=ev.pid,
            conn=conn,
            registered_at=now,
            last_seen=now,
        )
        log.info("registered %s (%s) at %s", ev.name, ev.role, ev.address)
        await self._tell(conn, ServiceRegistered(name=ev.name, run_id=self.run_id))
        changed = before ^ set(ev.publishes)
        if old is not None and old.address != ev.address:
            changed |= before | set(ev.publishes)
        await self._announce(changed)
        self._notify()

    async def on_peer_closed(self, conn: Connection) -> None:
        gone = [r for r in self.registry.values() if r.conn is conn]
        for record in gone:
            del self.registry[record.name]
            log.info("%s (%s) left", record.name, record.role)
        for watchers in self._watchers.values():
            watchers.discard(conn)
        await self._announce({t for r in gone for t in r.publishes})
        self._notify()

    async def _announce(self, topics: set[str]) -> None:
        for name in sorted(topics):
            update = PublishersChanged(topic=name, addresses=self.publishers(name))
            for watcher in list(self._watchers.get(name, ())):
                await self._tell(watcher, update)

    async def _tell(self, conn: Connection, ev: Event) -> None:
        try:
            await conn.send(self._frames(ev, CONTROL))
        except TianjiError as exc:
            log.debug("cannot tell %s about %s: %s", conn.peer, ev.TYPE, exc)
