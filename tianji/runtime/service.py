"""The service runtime: lifecycle and brokerless pub/sub (the service's side of it).

A service binds its own listener, registers it with the controller together with the topics it
publishes, and asks the controller who publishes the topics it subscribes to; it then connects
straight to those publishers (the data plane has no broker). Every message on a link is
``[topic, *codec frames]``; requests and replies between a service and the controller use the
empty topic.

Usage::

    class Doubler(Service):
        role = "relay"

        def __init__(self, name: str, **kw: Any) -> None:
            super().__init__(name, **kw)
            self.subscribe(ArraysPublished, self.on_arrays)

        async def on_arrays(self, ev: ArraysPublished) -> None:
            await self.publish(ev, topic("ArraysPublished", "doubled"))

    svc = Doubler("relay-0", bind="tcp://127.0.0.1:0", controller="tcp://127.0.0.1:7000")
    await svc.run()    # returns after stop(); raises ServiceFailed on failure

Backpressure: ``publish`` waits while any subscriber's connection is full and a slow handler stops
its link from reading, so a slow consumer slows its producers instead of growing queues. Nothing is
dropped silently: events to a topic nobody subscribes to, lost subscribers and bad frames are
counted in :attr:`Service.counters` and in heartbeats.

A service keeps its lifecycle and publishing; its parts get the narrow callables they need
(:mod:`~tianji.runtime.wiring`): subscribers (:mod:`~tianji.runtime.serving`), subscriptions
(:mod:`~tianji.runtime.links`), controller link and heartbeats (:mod:`~tianji.runtime.heartbeats`),
shared-memory board (:mod:`~tianji.runtime.sharing`).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import socket
import time
from collections.abc import Coroutine, Sequence
from typing import Any, ClassVar

from tianji.runtime import plugins
from tianji.runtime.board import Lease
from tianji.runtime.codec import Codec
from tianji.runtime.core import Connection, ServiceState
from tianji.runtime.errors import ServiceFailed, TianjiError
from tianji.runtime.events import (
    Event,
    Heartbeat,
    RegisterService,
    ServiceRegistered,
    WatchTopics,
    topic,
)
from tianji.runtime.heartbeats import ControllerLink, ServiceStat, memory_gauges
from tianji.runtime.links import E, Handler, Subscriptions
from tianji.runtime.loop import first_done
from tianji.runtime.publishing import Publishing
from tianji.runtime.scope import check_scope, full_name, scoped_topic, split_name, unscoped_topic
from tianji.runtime.serving import Peers
from tianji.runtime.sharing import BoardSharing, locality
from tianji.runtime.wiring import CONTROL, Decode, Encode, Messages, ServiceOptions

__all__ = ["CONTROL", "Handler", "Service", "ServiceOptions", "ServiceStat"]

log = logging.getLogger("tianji.service")


def _topic_name(t: str | type[Event]) -> str:
    return t if isinstance(t, str) else topic(t)


class Service:
    """Base class of every tianji service; see the module docstring for usage.

    Args:
        name: unique name of the service within a run (e.g. ``"actor-3"``).
        bind: the address to listen on; port 0 / empty inproc name pick a free one.
        controller: the controller's address (``None``: links wired by :meth:`add_publisher`).
        options: runtime knobs, see :class:`ServiceOptions`.
        publishes: topics (or event classes) this service publishes.
        advertise: the host other services should use to reach this one (registered in
            place of the bind host, e.g. the host's IP when binding ``0.0.0.0``).
        local_bind: a second listener for peers on the same host (e.g. ``"shm://"``); the
            controller hands its address to subscribers on this host, ``bind`` to others.
        scope: the group of services this one belongs to (a population member, ``m1``;
            :mod:`tianji.runtime.scope`): it is registered as ``<scope>.<name>``
            (:attr:`full_name`), keeps the local name as :attr:`name`, and every topic it
            names is that scope's. ``name`` may be given either way.
    """

    role: ClassVar[str] = "service"

    def __init__(
        self,
        name: str,
        *,
        bind: str = "inproc://",
        controller: str | None = None,
        options: ServiceOptions | None = None,
        publishes: Sequence[str | type[Event]] = (),
        advertise: str | None = None,
        local_bind: str | None = None,
        scope: str = "",
    ) -> None:
        plugins.split_address(bind)  # ConfigError naming a malformed address, now
        if local_bind is not None:
            plugins.split_address(local_bind)
        if controller is not None:
            plugins.split_address(controller)
        self.scope = check_scope(scope)
        self.name = split_name(name, scope)
        self.full_name = full_name(scope, self.name)
        """The name the run knows this service by (registry, heartbeats, commands)."""
        self.bind = bind
        self.advertise = advertise
        self.local_bind = local_bind
        self.local_address = ""
        self.run_digest = ""  # the run config's digest, checked by the controller if set
        self.locality = locality()  # services of one locality can share memory
        self.controller_address = controller
        self.options = options or ServiceOptions()
        self.address = ""
        self.counters: collections.Counter[str] = collections.Counter()
        self.gauges: dict[str, float] = {}
        self.stop_reason = ""
        self.run_id = ""
        self.resuming = False  # the run continues from a checkpoint (said at registration)
        self._state = ServiceState.CREATED
        limits = self.options.limits
        wire = Messages(Codec(max_frame_bytes=limits.max_frame_bytes, max_frames=limits.max_frames))
        self._frames: Encode = wire.encode  # (event, topic) -> message
        self._decode: Decode = wire.decode  # (message, peer) -> (topic, event)
        self._publishes: set[str] = {self._topic(t) for t in publishes}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._tg: asyncio.TaskGroup | None = None
        self._ready = asyncio.Event()
        self._stopping = asyncio.Event()
        self._changed = asyncio.Event()
        self._failure: str | None = None
        self._compose()

    def _compose(self) -> None:
        """Build the parts the service owns, each with the callables it needs."""
        self._peers = Peers(
            self.full_name,
            self.counters,
            spawn=self._spawn,
            decode=self._decode,
            notify=self._notify,
            on_subscribed=self._subscribed,
            on_request=self.on_request,
            on_peer_closed=self.on_peer_closed,
            locality=lambda: self.locality,
        )
        self._subscribers = self._peers.by_topic  # topic -> its subscribers' connections
        self._local_peers = self._peers.local  # those on this host (board readers)
        self._board = BoardSharing(self.counters, self._local_peers, self._frames, self._decode)
        self._publishing = Publishing(
            self.counters,
            self._peers,
            encode=self._frames,
            split=self._board.split,
            declare=self._declare,
        )
        self._subscriptions = Subscriptions(
            self.full_name,
            self.options,
            self.counters,
            spawn=self._spawn,
            encode=self._frames,
            decode=self._decode,
            send_quietly=self._send_quietly,
            from_board=self._board.resolve,
            report_soon=self.report_soon,
            stopping=self._stopping.is_set,
            locality=lambda: self.locality,
        )
        self._controller = ControllerLink(
            self.full_name,
            self.controller_address,
            self.options,
            self.counters,
            encode=self._frames,
            decode=self._decode,
            registration=self._registration,
            watched=self._subscriptions.handlers.keys,
            heartbeat=self.heartbeat,
            on_registered=self._on_registered,
            on_publishers=self._on_publishers,
            on_command=self.on_control,
            stop=self.stop,
            fail=self.fail,
            stopping=self._stopping.is_set,
        )

    def _topic(self, t: str | type[Event]) -> str:
        """The wire name of a topic this service names (its scope's)."""
        return scoped_topic(self.scope, _topic_name(t))

    async def _subscribed(self, conn: Connection, topics: Sequence[str]) -> None:
        """:meth:`on_subscribed` with the topics as this service names them."""
        if self.scope:
            topics = [unscoped_topic(self.scope, t) for t in topics]
        await self.on_subscribed(conn, topics)

    # ------------------------------------------------------------------ public API
    @property
    def state(self) -> ServiceState:
        return self._state

    def subscribe(
        self,
        topic_or_type: str | type[E],
        handler: Handler[E],
        *,
        latest_only: bool = False,
        on_demand: bool = False,
    ) -> None:
        """Call ``handler(event)`` for every event published on the topic.

        Handlers run one at a time per publisher link, in publication order; a slow
        handler applies backpressure to that publisher. ``latest_only``: only the newest
        event matters (weights), so a publisher the controller no longer lists for the
        topic (e.g. replaced by this host's relay) is left at once instead of read to the
        end of what it sends. ``on_demand`` (implies ``latest_only``): the publishers send
        the first event, then one more per :meth:`want` (:mod:`tianji.runtime.demand`).
        """
        name = self._topic(topic_or_type)
        first = self._subscriptions.add_handler(name, handler, latest_only, on_demand)
        conn = self._controller.registered_conn()
        if first and conn is not None:
            self._spawn(self._send_quietly(conn, WatchTopics(topics=(name,))))

    def want(self, topic_or_type: str | type[Event]) -> None:
        """Ask the publishers of a topic subscribed ``on_demand`` for their newest event."""
        self._subscriptions.want(self._topic(topic_or_type))

    def add_publisher(self, topic_or_type: str | type[Event], address: str) -> None:
        """Subscribe to ``topic`` at a known publisher address (manual wiring)."""
        self._subscriptions.link_to(address, {self._topic(topic_or_type)})

    async def publish(self, ev: Event, topic_name: str | None = None) -> int:
        """Send ``ev`` to every subscriber of its topic, waiting while any is full.

        Args:
            ev: the event.
            topic_name: the topic; defaults to ``topic(type(ev))``.

        Returns:
            How many subscribers it was sent to now (0 with none is counted as
            unsubscribed; one that takes the topic on demand may get it later).
        """
        if self.scope:
            topic_name = self._topic(topic_name or type(ev))
        return await self._publishing.publish(ev, topic_name)

    def publish_nowait(self, ev: Event, topic_name: str | None = None) -> int:
        """Like :meth:`publish` but raises :class:`~tianji.runtime.errors.WouldBlock` if any
        subscriber is full; subscribers before it in the list may already have it."""
        if self.scope:
            topic_name = self._topic(topic_name or type(ev))
        return self._publishing.publish_nowait(ev, topic_name)

    def subscriber_count(self, topic_or_type: str | type[Event]) -> int:
        """Subscribers connected for the topic now (an event published now reaches them)."""
        return len(self._subscribers.get(self._topic(topic_or_type), ()))

    async def wait_subscribers(self, topic_or_type: str | type[Event], count: int = 1) -> None:
        """Wait until at least ``count`` subscribers are connected for the topic."""
        name = self._topic(topic_or_type)
        self._declare(name)
        while len(self._subscribers.get(name, ())) < count:
            await self._wait_changed()

    async def wait_ready(self) -> None:
        """Wait until the service listens, is registered and knows its publishers."""
        await self._ready.wait()

    async def send_to_controller(self, ev: Event) -> None:
        """Send a request or report to the controller (e.g. ServiceReported)."""
        await self._controller.send(ev)

    def report_soon(self) -> None:
        """Send a heartbeat as soon as ``options.report_interval`` allows: call it when counters
        the controller balances on have changed, so its decisions follow the run closely."""
        self._controller.report_soon()

    def share_on_board(self, topic_name: str) -> None:
        """Send large events of ``topic_name`` to subscribers on this host through a shared
        memory board, when it has one (one write for all: :mod:`tianji.runtime.sharing`)."""
        self._board.share(self._topic(topic_name))

    def lease_of(self, ev: Event) -> Lease | None:
        """The board lease of an event this service received through a board (one of the
        last few), else ``None``: check ``valid()`` after copying its arrays out."""
        return self._board.lease_of(ev)

    def links_down(self) -> dict[str, str]:
        """Publisher address -> why this service cannot connect to it, for the links
        failing now (:meth:`tianji.runtime.links.Link.down_report`)."""
        return self._subscriptions.links_down()

    def stop(self, reason: str) -> None:
        """Ask the service to drain and stop (idempotent; the first reason is kept)."""
        if not self.stop_reason:
            self.stop_reason = reason
        self._stopping.set()

    @property
    def failure(self) -> str | None:
        """Why the service failed (:meth:`fail`), or ``None``."""
        return self._failure

    def fail(self, reason: str) -> None:
        """Stop the service and make :meth:`run` raise :class:`ServiceFailed`."""
        if self._failure is None:
            self._failure = reason
            log.error("%s failed: %s", self.full_name, reason)
        self.stop(f"failed: {reason}")

    # ------------------------------------------------------------------ hooks
    async def main(self) -> None:
        """The service's own work while RUNNING; when it returns, the service stops.

        The default waits until :meth:`stop` is called (handler-driven services).
        """
        await self._stopping.wait()

    async def on_request(self, ev: Event, conn: Connection) -> None:
        """Handle a non-Subscribe event sent to this service's listener."""
        self.counters["unexpected_requests"] += 1
        log.warning("%s: unexpected %s from %s", self.name, ev.TYPE, conn.peer)

    async def on_peer_closed(self, conn: Connection) -> None:
        """Called when an accepted connection ends (for any reason)."""

    async def on_subscribed(self, conn: Connection, topics: Sequence[str]) -> None:
        """Called when a peer subscribes to ``topics`` (e.g. to send it the latest state)."""

    async def send_to_subscriber(self, conn: Connection, ev: Event, topic_name: str) -> None:
        """Send one event to one subscriber connection (see :meth:`on_subscribed`); one
        that takes the topic on demand gets it when it wants one."""
        await self._publishing.send_one(conn, ev, self._topic(topic_name))

    async def on_control(self, ev: Event) -> None:
        """Handle a command from the controller other than the runtime's own."""
        log.warning("%s: unhandled control event %s", self.name, ev.TYPE)

    def queue_depths(self) -> dict[str, int]:
        """Queue depths reported in heartbeats (bytes waiting per subscriber, etc.)."""
        depths: dict[str, int] = {}
        self._peers.queue_depths(depths)
        self._subscriptions.queue_depths(depths)
        return depths

    def heartbeat(self) -> Heartbeat:
        """The heartbeat this service sends now (its gauges include the process's memory:
        ``rss_mb`` now and ``max_rss_mb`` since it started)."""
        counters = dict(self.counters)
        gauges = {**self.gauges, **memory_gauges()}
        self._subscriptions.handoff.report(counters, gauges)
        return Heartbeat(
            name=self.full_name,
            role=self.role,
            state=self._state.value,
            counters=counters,
            gauges=gauges,
            queue_depths=self.queue_depths(),
            sent_at=time.time(),
            links_down=self.links_down(),
        )

    # ------------------------------------------------------------------ lifecycle
    async def run(self) -> None:
        """Run the service until it is stopped; drain; release everything.

        Raises:
            ServiceFailed: if the service failed (see :meth:`fail`).
            RuntimeError: if run twice.
        """
        if self._state is not ServiceState.CREATED:
            raise RuntimeError(f"service {self.name} was already run")
        self._set_state(ServiceState.STARTING)
        self.address, self.local_address = await self._peers.listen(
            self.bind, self.local_bind, self.advertise, self.options.limits
        )
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                await self._run_phases()
        finally:
            await self._release()
        if self._failure is not None:
            raise ServiceFailed(self.full_name, self._failure)

    async def _run_phases(self) -> None:
        self._peers.accept_all()
        if self.controller_address is not None:
            self._spawn(self._controller.run())
            self._spawn(self._controller.heartbeats())
        else:
            self._controller.registered.set()
            self._check_ready()
        await first_done(self._ready.wait(), self._stopping.wait())
        main: asyncio.Task[None] | None = None
        if not self._stopping.is_set():
            self._set_state(ServiceState.RUNNING)
            main = self._spawn(self._run_main())
        await self._stopping.wait()
        self._set_state(ServiceState.DRAINING)
        if main is not None and not main.done():
            main.cancel()
            await asyncio.wait({main}, timeout=1.0)  # let its finally blocks count what is left
        # let subscribers take what is queued, then say goodbye to every peer
        await self._subscriptions.close()
        await self._peers.close(self.options.drain_timeout)
        await self._controller.goodbye()
        for task in list(self._tasks):
            task.cancel()

    async def _run_main(self) -> None:
        await self.main()
        self.stop("main finished")

    async def _release(self) -> None:
        await self._peers.abort()
        self._subscriptions.abort()
        self._board.close()
        self._set_state(ServiceState.STOPPED)
        log.info("%s stopped: %s", self.full_name, self.stop_reason or "cancelled")

    def _set_state(self, state: ServiceState) -> None:
        self._state = state
        if state is ServiceState.READY:
            self._ready.set()
        self._notify()

    def _check_ready(self) -> None:
        if self._state is ServiceState.STARTING and self._controller.complete():
            self._set_state(ServiceState.READY)

    def _on_registered(self, ev: ServiceRegistered) -> None:
        self.run_id, self.resuming = ev.run_id, ev.resuming
        self._check_ready()

    def _on_publishers(self, name: str, addresses: Sequence[str]) -> None:
        self._subscriptions.set_publishers(name, addresses, {self.address, self.local_address})
        self._check_ready()

    def _registration(self) -> RegisterService:
        return RegisterService(
            name=self.full_name,
            role=self.role,
            address=self.address,
            publishes=tuple(sorted(self._publishes)),
            host=socket.gethostname(),
            pid=os.getpid(),
            local_address=self.local_address,
            locality=self.locality,
            run_digest=self.run_digest,
        )

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        if self._tg is None:
            raise RuntimeError(f"service {self.name} is not running")
        task = self._tg.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _wait_changed(self) -> None:
        await self._changed.wait()

    def _declare(self, name: str) -> None:
        """Add ``name`` to the published topics, telling the controller if connected."""
        if name not in self._publishes:
            self._publishes.add(name)
            conn = self._controller.registered_conn()
            if conn is not None:
                self._spawn(self._send_quietly(conn, self._registration()))

    async def _send_quietly(self, conn: Connection | None, ev: Event) -> None:
        """Send a request in the background; a broken link is not fatal here, because the
        reconnect path sends the full registration / subscription again."""
        if conn is None:
            return
        try:
            await conn.send(self._frames(ev, CONTROL))
        except TianjiError as exc:
            self.counters["requests_unsent"] += 1
            log.info("%s: %s not sent to %s: %s", self.name, ev.TYPE, conn.peer, str(exc))
