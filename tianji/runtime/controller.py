r"""The controller's control plane: registry of services and the topics they publish.

Services register their listening address and published topics; subscribers watch
topics and are told the publishers' addresses now and on every change, then connect to
the publishers directly (bulk data never passes through the controller). The controller
also keeps each service's latest heartbeat, collects reports and broadcasts commands.

It knows no RL: what a run needs beyond the registry (the balance of production and
consumption, the run's sample accounting) reaches it as a :class:`ControllerPlugin`, e.g.
:class:`tianji.services.balancer.Balancer`. A plug-in sees every heartbeat of the roles it
names, sends commands through the controller, adds gauges to the controller's heartbeat and
settles the counts of a service that died.

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
import collections
import dataclasses
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import msgspec

from tianji.runtime.aggregation import AGGREGATOR_ROLE, HEARTBEATS_TOPIC
from tianji.runtime.core import Connection
from tianji.runtime.errors import TianjiError
from tianji.runtime.events import (
    Event,
    Heartbeat,
    HeartbeatBatch,
    PublishersChanged,
    RegisterService,
    ServiceRegistered,
    ServiceReported,
    Shutdown,
    WatchTopics,
)
from tianji.runtime.registry import Registry
from tianji.runtime.rounds import BatchRounds
from tianji.runtime.service import CONTROL, Service

__all__ = ["AGGREGATOR_ROLE", "HEARTBEATS_TOPIC", "REFUSED", "RELAY_ROLE", "Controller"]
__all__ += ["ControllerPlugin", "Registry", "Send", "ServiceRecord"]

log = logging.getLogger("tianji.controller")

ANNOUNCE_DELAY = 0.02
"""Seconds a change of a topic's publishers waits (those within it told together)."""

UPDATE_S_PER_SERVICE, MAX_UPDATE_INTERVAL = 20e-6, 0.05
"""Plug-in updates are at least ``min(MAX_UPDATE_INTERVAL, services x UPDATE_S_PER_SERVICE)``
seconds apart (heartbeats in between are decided together): a bounded share of a core, not
one decision per heartbeat (0.2 ms apart with 10 services; 20 ms with 1,000)."""

RELAY_ROLE = "relay"
"""Services of this role republish a topic for the subscribers of their locality (a
per-host params relay): those subscribers are told the relay only, the relay the origin.
A node's heartbeat aggregator: :mod:`tianji.runtime.aggregation`."""
REFUSED = "refused:"
"""How the reason of a :class:`Shutdown` refusing a registration starts."""

Send = Callable[[str, Event], Awaitable[bool]]
"""``await send(service_name, event) -> delivered``: how a plug-in sends a command."""
P = TypeVar("P")


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
    local_address: str = ""
    locality: str = ""
    last_heartbeat: Heartbeat | None = None
    last_seen: float = 0.0


class ControllerPlugin(Protocol):
    """What the controller runs beside its registry (the run's balance, for one).

    ``roles``: heartbeats of these roles wake :meth:`update` (one call at a time, on the
    latest heartbeats of every service, live and retired). ``attach`` hands it the
    controller's ``send``. ``gauges`` go into the controller's heartbeat. When a service
    dies and will be restarted, ``retired`` may rewrite the last heartbeat kept under its
    retired name (count what it held as lost) and ``forget`` drops its state; when the
    next incarnation registers, ``rejoined`` may settle the retired one's counts.
    """

    roles: frozenset[str]

    def attach(self, send: Send) -> None: ...

    async def update(
        self, heartbeats: Mapping[str, Heartbeat], live: Mapping[str, ServiceRecord]
    ) -> None: ...

    def gauges(self) -> dict[str, float]: ...

    def forget(self, name: str) -> None: ...

    def retired(self, hb: Heartbeat) -> Heartbeat: ...

    def rejoined(self, retired: str, heartbeats: dict[str, Heartbeat]) -> None: ...


class Controller(Service):
    """Registry, heartbeats, reports and commands; see the module docstring.

    Args:
        name: the controller's service name.
        run_id: identifies the run; generated when omitted.
        plugins: what runs beside the registry (:class:`ControllerPlugin`).
        kwargs: passed to :class:`~tianji.runtime.service.Service` (``bind``, ``options``).
    """

    role = "controller"

    def __init__(
        self,
        name: str = "controller",
        *,
        run_id: str | None = None,
        plugins: Sequence[ControllerPlugin] = (),
        **kwargs: Any,
    ):
        super().__init__(name, **kwargs)
        self.plugins = tuple(plugins)
        self._plugin_roles = frozenset(r for plugin in self.plugins for r in plugin.roles)
        for plugin in self.plugins:
            plugin.attach(self._command)
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.resuming = False
        """The run continues from a checkpoint: told to every service that registers."""
        self.run_digest = ""  # when set, services registering another digest are refused
        self._plugins_wanted = asyncio.Event()
        self._rounds = BatchRounds(self.counters)
        self.plugin_updates = 0  # plug-in update rounds so far
        self.registry: dict[str, ServiceRecord] = Registry()
        self.reports: dict[str, ServiceReported] = {}
        # the latest heartbeat per service, kept after it leaves
        self.heartbeats: dict[str, Heartbeat] = Registry()
        self.restarts: collections.Counter[str] = collections.Counter()  # by service name
        self.reincarnated: Callable[[str, str, int], None] | None = None
        """Called with (name, role, k) when a service registers as a new process (another
        host or pid than its last registration) that no launcher retired: the k-th
        restart of a service restarted where it runs (``tianji serve --restart``)."""
        self._incarnations: dict[str, tuple[str, int] | None] = {}  # (host, pid); None: retired
        self._watchers: dict[str, set[Connection]] = {}
        self._by_conn: dict[Connection, ServiceRecord] = {}  # the registry by connection
        self._dirty: set[str] = set()  # topics whose watchers are told soon (_announce_soon)
        self._announcing: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ queries
    def plugin(self, kind: type[P]) -> P | None:
        """The plug-in of class ``kind``, or None."""
        for plugin in self.plugins:
            if isinstance(plugin, kind):
                return plugin
        return None

    def publishers(
        self, topic_name: str, locality: str = "", relay: bool = False
    ) -> tuple[str, ...]:
        """Addresses of the services that publish ``topic_name``, sorted: for a subscriber
        of the given ``locality`` a publisher's local address (shared memory) where it has
        one and shares that locality, else its main address (TCP).

        Where a relay (role :data:`RELAY_ROLE`) of the subscriber's locality republishes
        the topic, only the relay (the first by name of several); a relay (``relay``) and
        the subscribers of a locality without one are told the topic's other publishers.
        """
        records = [r for r in self.registry.values() if topic_name in r.publishes]
        if topic_name == HEARTBEATS_TOPIC:  # only the aggregator of the subscriber's node
            records = sorted(
                (r for r in records if locality and r.locality == locality),
                key=lambda r: r.name,
            )[:1]
        relays = [r for r in records if r.role == RELAY_ROLE]
        if relays:
            # one relay per locality: of two (one restarted away from its lost node, say)
            # the subscribers take the first by name, never both
            here = sorted(
                (r for r in relays if locality and r.locality == locality), key=lambda r: r.name
            )[:1]
            records = here if here and not relay else [r for r in records if r not in relays]
        return tuple(
            sorted(
                r.local_address
                if locality and r.local_address and r.locality == locality
                else r.address
                for r in records
            )
        )

    def failing_links(self) -> dict[str, dict[str, str]]:
        """Failing subscription links of the registered services, from their latest
        heartbeats: subscriber -> {``"PUBLISHER ADDRESS"`` (the publisher's name when it is
        registered under that address): why the subscriber cannot connect}."""
        owner = {}
        for record in self.registry.values():
            for address in (record.address, record.local_address):
                if address:
                    owner[address] = record.name
        down: dict[str, dict[str, str]] = {}
        for name, record in sorted(self.registry.items()):
            hb = record.last_heartbeat
            if hb is not None and hb.links_down:
                down[name] = {
                    f"{owner.get(address, '?')} {address}": why
                    for address, why in sorted(hb.links_down.items())
                }
        return down

    def _record_of(self, conn: Connection) -> ServiceRecord | None:
        """The registered service on ``conn`` (O(1); the registry is scanned only when the
        index does not know the connection, e.g. records put in by hand)."""
        record = self._by_conn.get(conn)
        if record is not None and self.registry.get(record.name) is record:
            return record
        return next((r for r in self.registry.values() if r.conn is conn), None)

    def _locality_of(self, conn: Connection) -> tuple[str, bool]:
        """The locality of the service on ``conn`` and whether it is a relay."""
        record = self._record_of(conn)
        if record is None:
            return "", False
        return record.locality, record.role == RELAY_ROLE

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
                log.warning("cannot send %s to %s: %s", ev.TYPE, record.name, str(exc))
        return sent

    async def shutdown_all(self, reason: str) -> int:
        """Tell every registered service to drain and stop."""
        return await self.broadcast(Shutdown(reason=reason))

    async def main(self) -> None:
        if not self.plugins:
            await super().main()
            return
        await self._plugin_loop()

    async def _plugin_loop(self) -> None:
        """Plug-in updates, one at a time, on the latest heartbeats (two interleaved
        decisions could send commands out of order: a pause after the resume that
        superseded it). Spaced by the run's size (``UPDATE_S_PER_SERVICE``); the batches
        of one flush tick are decided together (:mod:`tianji.runtime.rounds`)."""
        loop = asyncio.get_running_loop()
        while True:
            await self._plugins_wanted.wait()
            await self._rounds.gather()  # the other nodes' batches of the same flush tick
            self._plugins_wanted.clear()
            self._rounds.close()
            started = loop.time()
            for plugin in self.plugins:
                await plugin.update(self.heartbeats, self.registry)
                self.gauges.update(plugin.gauges())  # in the controller's heartbeat
            self.plugin_updates += 1
            spacing = min(MAX_UPDATE_INTERVAL, len(self.heartbeats) * UPDATE_S_PER_SERVICE)
            rest = started + spacing - loop.time()
            if rest > 0:
                await asyncio.sleep(rest)

    # ------------------------------------------------------------------ requests
    async def on_request(self, ev: Event, conn: Connection) -> None:
        if isinstance(ev, RegisterService):
            await self._register(ev, conn)
        elif isinstance(ev, WatchTopics):
            where = self._locality_of(conn)
            for name in ev.topics:
                self._watchers.setdefault(name, set()).add(conn)
                await self._tell(
                    conn, PublishersChanged(topic=name, addresses=self.publishers(name, *where))
                )
        elif isinstance(ev, Heartbeat):
            record = self.registry.get(ev.name)
            if record is not None and record.conn is conn and self._take(ev, record):
                self._plugins_wanted.set()  # decided by _plugin_loop, one at a time
            self._notify()
        elif isinstance(ev, HeartbeatBatch):
            self._take_batch(ev, conn)
        elif isinstance(ev, ServiceReported):
            self.reports[ev.name] = ev
            log.info("%s reported %s: %s", ev.name, ev.status, ev.summary)
            self._notify()
        else:
            await super().on_request(ev, conn)

    def _take(self, hb: Heartbeat, record: ServiceRecord, now: float | None = None) -> bool:
        """Keep ``hb`` as the latest of ``record``'s service (seen at ``now``, a monotonic
        time), unless that service retired (``hb`` is a dead incarnation's). True if a
        plug-in wants to see it."""
        if self._incarnations.get(hb.name, ()) is None:
            self.counters["heartbeats_refused"] += 1
            return False
        self.heartbeats[hb.name] = hb
        record.last_heartbeat = hb
        record.last_seen = time.monotonic() if now is None else now
        return hb.role in self._plugin_roles

    def _take_batch(self, batch: HeartbeatBatch, conn: Connection) -> None:
        """Take the heartbeats of an aggregator's batch as direct ones, each only if its
        service is registered on the aggregator's node; wake the plug-ins once."""
        sender = self._record_of(conn)
        if sender is None or sender.role != AGGREGATOR_ROLE or not sender.locality:
            self.counters["heartbeat_batches_refused"] += 1
            log.warning("%s's heartbeat batch: not a registered aggregator's", batch.aggregator)
            return
        wanted, now = False, time.monotonic()
        self._rounds.arrived(sender.name)
        for hb in batch.heartbeats:
            record, kept = self.registry.get(hb.name), self.heartbeats.get(hb.name)
            if record is None or record.locality != sender.locality:
                self.counters["heartbeats_refused"] += 1
            elif kept is not None and hb.sent_at < kept.sent_at:  # a direct one overtook it
                self.counters["heartbeats_overtaken"] += 1
            elif self._take(hb, record, now):
                wanted = True
        if wanted:
            self._plugins_wanted.set()
        self._notify()

    async def _register(self, ev: RegisterService, conn: Connection) -> None:
        if self.run_digest and ev.run_digest and ev.run_digest != self.run_digest:
            why = (
                f"{REFUSED} {ev.name}'s run config (digest {ev.run_digest}) differs from the "
                f"controller's ({self.run_digest}); start it with the same config and --set"
            )
            log.error("%s", why)
            self.counters["registrations_refused"] += 1
            await self._tell(conn, Shutdown(reason=why))
            return
        known = self._incarnations.get(ev.name, (ev.host, ev.pid))
        if known is not None and known != (ev.host, ev.pid):
            # a new process under a known name that no launcher retired: it was restarted
            # where it runs (tianji serve --restart); the old one is dead
            log.warning("%s registered as a new process (pid %d on %s)", ev.name, ev.pid, ev.host)
            self.retire(ev.name)
            if self.reincarnated is not None:
                self.reincarnated(ev.name, ev.role, self.restarts[ev.name])
        self._incarnations[ev.name] = (ev.host, ev.pid)
        if self.restarts.get(ev.name) and ev.name not in self.heartbeats:
            retired = f"{ev.name}#{self.restarts[ev.name]}"  # the next incarnation joins
            for plugin in self.plugins:
                plugin.rejoined(retired, self.heartbeats)
        old = self.registry.get(ev.name)
        if old is not None and old.conn is not conn:
            log.warning(
                "%s registered again from %s; replacing %s", ev.name, ev.address, old.address
            )
        before = set(old.publishes) if old is not None else set()
        now = time.monotonic()
        record = self.registry[ev.name] = ServiceRecord(
            name=ev.name,
            role=ev.role,
            address=ev.address,
            publishes=ev.publishes,
            host=ev.host,
            pid=ev.pid,
            conn=conn,
            registered_at=now,
            last_seen=now,
            local_address=ev.local_address,
            locality=ev.locality,
        )
        self._by_conn[conn] = record
        log.info("registered %s (%s) at %s", ev.name, ev.role, ev.address)
        registered = ServiceRegistered(name=ev.name, run_id=self.run_id, resuming=self.resuming)
        await self._tell(conn, registered)
        changed = before ^ set(ev.publishes)
        if old is not None and (old.address, old.local_address) != (
            ev.address,
            ev.local_address,
        ):
            changed |= before | set(ev.publishes)
        self._announce_soon(changed)
        self._notify()

    async def on_peer_closed(self, conn: Connection) -> None:
        record = self._record_of(conn)
        self._by_conn.pop(conn, None)
        gone = [record] if record is not None else []
        for record in gone:
            del self.registry[record.name]
            log.info("%s (%s) left", record.name, record.role)
        for watchers in self._watchers.values():
            watchers.discard(conn)
        self._announce_soon({t for r in gone for t in r.publishes})
        self._notify()

    def _announce_soon(self, topics: set[str]) -> None:
        """Tell the topics' watchers their publishers in :data:`ANNOUNCE_DELAY` seconds:
        a burst of registrations (thousands of actors joining) costs each watcher one
        list per topic per delay, not one per registration."""
        if not topics or self._stopping.is_set():  # draining: everyone is leaving
            return
        self._dirty |= topics
        if self._announcing is None or self._announcing.done():
            self._announcing = self._spawn(self._announce_later())

    async def _announce_later(self) -> None:
        await asyncio.sleep(ANNOUNCE_DELAY)
        topics, self._dirty = self._dirty, set()
        await self._announce(topics)

    async def _announce(self, topics: set[str]) -> None:
        for name in sorted(topics):
            lists: dict[tuple[str, bool], tuple[str, ...]] = {}  # by locality, relay or not
            for watcher in list(self._watchers.get(name, ())):
                where = self._locality_of(watcher)
                if where not in lists:
                    lists[where] = self.publishers(name, *where)
                await self._tell(watcher, PublishersChanged(topic=name, addresses=lists[where]))

    def retire(self, name: str) -> None:
        """``name`` died and will be restarted: its last counts stay under ``name#<k>`` (k-th
        death, :meth:`bury`) so the run's totals stay cumulative, and the next incarnation
        reports from zero under ``name``."""
        self.restarts[name] += 1
        self._incarnations[name] = None  # its heartbeats end here; the next one registers
        for plugin in self.plugins:
            plugin.forget(name)
        self.bury(name, f"{name}#{self.restarts[name]}")

    def bury(self, name: str, under: str | None = None) -> None:
        """``name`` died: its last heartbeat stays under ``under`` (default ``name``: for good,
        the run stops) marked dead, what it held counted lost by the plug-ins."""
        hb, under = self.heartbeats.pop(name, None), under or name
        if hb is None:
            return
        hb = msgspec.structs.replace(hb, name=under, state="dead")
        for plugin in self.plugins:
            hb = plugin.retired(hb)
        self.heartbeats[under] = hb
        self._notify()

    async def command(self, name: str, ev: Event) -> bool:
        """Send a command to one registered service; False if it is not registered or the
        send failed."""
        return await self._command(name, ev)

    async def _command(self, name: str, ev: Event) -> bool:
        record = self.registry.get(name)
        if record is None:
            return False
        try:
            await record.conn.send(self._frames(ev, CONTROL))
        except TianjiError as exc:
            log.info("cannot send %s to %s: %s", ev.TYPE, name, str(exc))
            return False
        return True

    async def _tell(self, conn: Connection, ev: Event) -> None:
        try:
            await conn.send(self._frames(ev, CONTROL))
        except TianjiError as exc:
            log.debug("cannot tell %s about %s: %s", conn.peer, ev.TYPE, str(exc))
