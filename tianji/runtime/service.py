"""The service runtime: lifecycle and brokerless pub/sub (the service's side of it; its
subscriptions are :mod:`tianji.runtime.links`, its controller link and heartbeats
:mod:`tianji.runtime.heartbeats`).

A service binds its own listener, registers it with the controller together with the
topics it publishes, and asks the controller who publishes the topics it subscribes to;
it then connects straight to those publishers (the data plane has no broker). Every
message on a link is ``[topic, *codec frames]``; requests and replies between a service
and the controller use the empty topic.

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

Backpressure: ``publish`` waits while any subscriber's connection is full, and a handler
that is slow stops its link from reading, so a slow consumer slows its producers down
instead of growing queues. Nothing is dropped silently: events published to a topic
nobody subscribes to, lost subscribers and bad frames are all counted in
:attr:`Service.counters` and reported in heartbeats.

Over 500 lines: the base class every service extends keeps its lifecycle, publishing
and serving in one place; its subscriptions and its controller link are apart
(:mod:`tianji.runtime.links`, :mod:`tianji.runtime.heartbeats`).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, ClassVar, TypeVar

from tianji.runtime import plugins
from tianji.runtime.codec import Codec
from tianji.runtime.core import Connection, Limits, Listener, ServiceState
from tianji.runtime.errors import BadFrame, ClosedByUs, EndOfStream, ServiceFailed, TianjiError
from tianji.runtime.events import (
    Event,
    Heartbeat,
    Subscribe,
    WatchTopics,
    event_type_of_topic,
    topic,
)
from tianji.runtime.heartbeats import ControllerLink, ServiceStat, memory_gauges
from tianji.runtime.leases import Handoff
from tianji.runtime.links import CONTROL, Link, Subscriptions
from tianji.runtime.sharing import BoardSharing, FrameList

__all__ = ["CONTROL", "Handler", "Service", "ServiceOptions", "ServiceStat"]

log = logging.getLogger("tianji.service")


E = TypeVar("E", bound=Event)
Handler = Callable[[E], Awaitable[None]]
_YIELD_EVERY = 32


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ServiceOptions:
    """Runtime knobs shared by every service.

    Attributes:
        limits: bounds of every connection the service opens or accepts.
        heartbeat_interval: seconds between heartbeats to the controller.
        report_interval: the shortest gap (s) between two heartbeats; :meth:`Service.report_soon`
            asks for one early.
        reconnect_min: first retry delay (s) after a link breaks; doubles up to reconnect_max.
        reconnect_max: longest retry delay (s).
        controller_grace: a service that cannot reach its controller this long fails.
        drain_timeout: seconds a stopping service waits for subscribers to take queued data.
    """

    limits: Limits = dataclasses.field(default_factory=Limits)
    heartbeat_interval: float = 1.0
    report_interval: float = 0.01
    reconnect_min: float = 0.05
    reconnect_max: float = 2.0
    controller_grace: float = 15.0
    drain_timeout: float = 10.0


def _topic_name(t: str | type[Event]) -> str:
    return t if isinstance(t, str) else topic(t)


class Service(ControllerLink, Subscriptions, BoardSharing):
    """Base class of every tianji service; see the module docstring for usage.

    Args:
        name: unique name of the service within a run (e.g. ``"actor-3"``).
        bind: the address to listen on; port 0 / empty inproc name pick a free one.
        controller: the controller's address, or ``None`` to wire links by hand
            (:meth:`add_publisher`) as tests and single-process runs may.
        options: runtime knobs, see :class:`ServiceOptions`.
        publishes: topics (or event classes) this service publishes.
        advertise: the host other services should use to reach this one (registered in
            place of the bind host, e.g. the host's IP when binding ``0.0.0.0``).
        local_bind: a second listener for peers on the same host (e.g. ``"shm://"``); the
            controller hands its address to subscribers on this host, ``bind`` to others.
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
    ) -> None:
        plugins.split_address(bind)  # ConfigError naming a malformed address, now
        if local_bind is not None:
            plugins.split_address(local_bind)
        if controller is not None:
            plugins.split_address(controller)
        self.name = name
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
        self._state = ServiceState.CREATED
        self._codec = Codec(
            max_frame_bytes=self.options.limits.max_frame_bytes,
            max_frames=self.options.limits.max_frames,
        )
        self._handlers: dict[str, list[Handler[Any]]] = {}
        self._publishes: set[str] = {_topic_name(t) for t in publishes}
        self._subscribers: dict[str, set[Connection]] = {}
        self._links: dict[str, Link] = {}
        self._latest_only: set[str] = set()  # topics subscribed with latest_only
        self._handoff = Handoff()  # zero-copy events over shm links (tianji.runtime.leases)
        self._peers: set[Connection] = set()
        self._listener: Listener | None = None
        self._local_listener: Listener | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._tg: asyncio.TaskGroup | None = None
        self._controller_conn: Connection | None = None
        self._registered = asyncio.Event()
        self._watch_pending: set[str] = set()
        self._ready = asyncio.Event()
        self._stopping = asyncio.Event()
        self._report_wanted = asyncio.Event()
        self._changed = asyncio.Event()
        self._failure: str | None = None
        self._unyielded = 0
        self._init_sharing()

    # ------------------------------------------------------------------ public API
    @property
    def state(self) -> ServiceState:
        return self._state

    def subscribe(
        self, topic_or_type: str | type[E], handler: Handler[E], *, latest_only: bool = False
    ) -> None:
        """Call ``handler(event)`` for every event published on the topic.

        Handlers run one at a time per publisher link, in publication order; a slow
        handler applies backpressure to that publisher. ``latest_only``: only the newest
        event matters (weights), so a publisher the controller no longer lists for the
        topic (e.g. replaced by this host's relay) is left at once instead of read to the
        end of what it sends.
        """
        name = _topic_name(topic_or_type)
        if latest_only:
            self._latest_only.add(name)
        first = name not in self._handlers
        self._handlers.setdefault(name, []).append(handler)
        if first and self._controller_conn is not None and self._registered.is_set():
            self._spawn(self._send_quietly(self._controller_conn, WatchTopics(topics=(name,))))

    def add_publisher(self, topic_or_type: str | type[Event], address: str) -> None:
        """Subscribe to ``topic`` at a known publisher address (manual wiring)."""
        self._link_to(address, {_topic_name(topic_or_type)})

    async def publish(self, ev: Event, topic_name: str | None = None) -> int:
        """Send ``ev`` to every subscriber of its topic, waiting while any is full.

        Args:
            ev: the event.
            topic_name: the topic; defaults to ``topic(type(ev))``.

        Returns:
            How many subscribers it was delivered to (0 is counted as unsubscribed).
        """
        frames, conns, shared = self._prepare_publish(ev, topic_name)
        delivered = 0
        for conn in conns:
            try:
                await conn.send(
                    shared if shared is not None and conn in self._local_peers else frames
                )
                delivered += 1
            except TianjiError as exc:
                self._drop_subscriber(conn, exc)
        # A send that finds room does not suspend; yield now and then so a producer in a
        # tight loop never starves heartbeats, control commands or signal handlers.
        self._unyielded += 1
        if self._unyielded >= _YIELD_EVERY or not conns:
            self._unyielded = 0
            await asyncio.sleep(0)
        return delivered

    def publish_nowait(self, ev: Event, topic_name: str | None = None) -> int:
        """Like :meth:`publish` but raises :class:`~tianji.runtime.errors.WouldBlock` if any
        subscriber is full; subscribers before it in the list may already have it."""
        frames, conns, shared = self._prepare_publish(ev, topic_name)
        for conn in conns:
            conn.send_nowait(shared if shared is not None and conn in self._local_peers else frames)
        return len(conns)

    def subscriber_count(self, topic_or_type: str | type[Event]) -> int:
        """Subscribers connected for the topic now (an event published now reaches them)."""
        return len(self._subscribers.get(_topic_name(topic_or_type), ()))

    async def wait_subscribers(self, topic_or_type: str | type[Event], count: int = 1) -> None:
        """Wait until at least ``count`` subscribers are connected for the topic."""
        name = _topic_name(topic_or_type)
        self._declare(name)
        while len(self._subscribers.get(name, ())) < count:
            await self._wait_changed()

    async def wait_ready(self) -> None:
        """Wait until the service listens, is registered and knows its publishers."""
        await self._ready.wait()

    async def send_to_controller(self, ev: Event) -> None:
        """Send a request or report to the controller (e.g. ServiceReported)."""
        await self._send_control(ev)

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
            log.error("%s failed: %s", self.name, reason)
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
        """Send one event to one subscriber connection (see :meth:`on_subscribed`)."""
        frames = self._frames(ev, topic_name)
        shared, sent = self._split_for_board(topic_name, frames, [conn])
        self.counters[ServiceStat.PUBLISHED_BYTES] += sent
        await conn.send(frames if shared is None else shared)

    async def on_control(self, ev: Event) -> None:
        """Handle a command from the controller other than the runtime's own."""
        log.warning("%s: unhandled control event %s", self.name, ev.TYPE)

    def queue_depths(self) -> dict[str, int]:
        """Queue depths reported in heartbeats (bytes waiting per subscriber, etc.)."""
        depths: dict[str, int] = {}
        for conns in self._subscribers.values():
            for conn in conns:
                depths[f"to:{conn.peer}"] = conn.statistics().send_queue_bytes
        for link in self._links.values():
            if link.conn is not None:
                depths[f"from:{link.address}"] = link.conn.statistics().recv_queue_messages
        return depths

    def heartbeat(self) -> Heartbeat:
        """The heartbeat this service sends now (its gauges include the process's memory:
        ``rss_mb`` now and ``max_rss_mb`` since it started)."""
        counters = dict(self.counters)
        handoff = self._handoff
        if handoff.arrays_copied or handoff.leases_held:
            counters["zero_copy_arrays_copied"] = handoff.arrays_copied
            counters["zero_copy_leases_held"] = handoff.leases_held
        gauges = {**self.gauges, **memory_gauges()}
        if handoff.held_now:
            gauges["held_leases"] = float(handoff.held_now)
        return Heartbeat(
            name=self.name,
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
        transport = plugins.transport_for(self.bind)
        self._listener = await transport.listen(self.bind, limits=self.options.limits)
        self.address = advertised(self._listener.address, self.advertise)
        try:
            if self.local_bind is not None:
                local = plugins.transport_for(self.local_bind)
                self._local_listener = await local.listen(
                    self.local_bind, limits=self.options.limits
                )
                self.local_address = self._local_listener.address
        except BaseException:
            await self._listener.aclose()
            raise
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                await self._run_phases()
        finally:
            await self._release()
        if self._failure is not None:
            raise ServiceFailed(self.name, self._failure)

    async def _run_phases(self) -> None:
        self._spawn(self._accept_loop(self._listener))
        if self._local_listener is not None:
            self._spawn(self._accept_loop(self._local_listener, local=True))
        if self.controller_address is not None:
            self._spawn(self._controller_loop())
            self._spawn(self._heartbeat_loop())
        else:
            self._registered.set()
            self._check_ready()
        await _first(self._ready.wait(), self._stopping.wait())
        main: asyncio.Task[None] | None = None
        if not self._stopping.is_set():
            self._set_state(ServiceState.RUNNING)
            main = self._spawn(self._run_main())
        await self._stopping.wait()
        self._set_state(ServiceState.DRAINING)
        if main is not None and not main.done():
            main.cancel()
            await asyncio.wait({main}, timeout=1.0)  # let its finally blocks count what is left
        await self._drain()
        for task in list(self._tasks):
            task.cancel()

    async def _run_main(self) -> None:
        await self.main()
        self.stop("main finished")

    async def _drain(self) -> None:
        """Let subscribers take what is queued, then say goodbye to every peer."""

        async def leave(link: Link) -> None:
            link.retired = True
            if link.conn is not None:
                try:
                    await asyncio.wait_for(link.conn.aclose(), 1.0)  # goodbye, not a vanish
                except (TianjiError, TimeoutError) as exc:
                    log.debug("%s: link %s closed unanswered: %r", self.name, link.conn.peer, exc)
                    link.conn.abort()  # it did not answer: do not keep its sender waiting
            if link.task is not None:
                link.task.cancel()

        # every link at once (a late PublishersChanged may add one: iterate a copy)
        await asyncio.gather(*(leave(link) for link in list(self._links.values())))
        subscribers = {c for conns in self._subscribers.values() for c in conns}
        deadline = self.options.drain_timeout

        async def close(conn: Connection) -> None:
            try:
                await asyncio.wait_for(conn.drain(), deadline)
                await asyncio.wait_for(conn.aclose(), deadline)
            except EndOfStream:  # the peer said goodbye first: nothing left to deliver
                conn.abort()
            except (TianjiError, TimeoutError) as exc:
                self.counters["drain_failures"] += 1
                log.warning("%s: could not drain %s: %s", self.name, conn.peer, str(exc))
                conn.abort()

        await asyncio.gather(*(close(c) for c in subscribers | self._peers))
        controller = self._controller_conn
        if controller is not None:
            try:  # the last counts, so the controller's books have them
                await controller.send(self._frames(self.heartbeat(), CONTROL))
                await asyncio.wait_for(controller.aclose(), 2.0)
            except (TianjiError, TimeoutError) as exc:
                log.info("%s: last heartbeat or goodbye to the controller: %r", self.name, exc)
                controller.abort()

    async def _release(self) -> None:
        for listener in (self._listener, self._local_listener):
            if listener is not None:
                await listener.aclose()
        for conn in list(self._peers):
            conn.abort()
        for link in self._links.values():
            if link.conn is not None:
                link.conn.abort()
        self._close_sharing()
        self._set_state(ServiceState.STOPPED)
        log.info("%s stopped: %s", self.name, self.stop_reason or "cancelled")

    def _set_state(self, state: ServiceState) -> None:
        self._state = state
        if state is ServiceState.READY:
            self._ready.set()
        self._notify()

    def _check_ready(self) -> None:
        registered = self._registered.is_set() and not self._watch_pending
        if self._state is ServiceState.STARTING and registered:
            self._set_state(ServiceState.READY)

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

    # ------------------------------------------------------------------ wire helpers
    def _frames(self, ev: Event, topic_name: str) -> list[bytes | bytearray | memoryview]:
        return [topic_name.encode(), *self._codec.encode(ev)]

    def _decode(self, frames: list[memoryview], peer: str) -> tuple[str, Event]:
        try:
            if len(frames) < 2:
                raise BadFrame("missing_topic", f"{len(frames)} frames; need topic + header")
            try:
                name = bytes(frames[0]).decode()
            except UnicodeDecodeError:
                raise BadFrame("bad_topic", f"topic frame {bytes(frames[0][:40])!r}") from None
            ev = self._codec.decode(frames[1:])
            if name and event_type_of_topic(name) != ev.TYPE:
                raise BadFrame("topic_mismatch", f"{ev.TYPE} event on topic {name!r}")
            return name, ev
        except BadFrame as exc:
            raise exc.with_peer(peer) from None

    def _prepare_publish(
        self, ev: Event, topic_name: str | None
    ) -> tuple[FrameList, list[Connection], FrameList | None]:
        """The event's frames, its subscribers now and (for a topic shared on the board,
        :meth:`share_on_board`) the reference frames for the local ones."""
        name = topic_name or topic(type(ev))
        if event_type_of_topic(name) != ev.TYPE:
            raise ValueError(f"topic {name!r} does not carry {ev.TYPE} events")
        self._declare(name)
        self.counters[ServiceStat.PUBLISHED] += 1
        conns = list(self._subscribers.get(name, ()))
        frames = self._frames(ev, name)
        if not conns:
            self.counters["published_unsubscribed"] += 1
            return frames, conns, None
        shared, sent = self._split_for_board(name, frames, conns)
        self.counters[ServiceStat.PUBLISHED_BYTES] += sent
        return frames, conns, shared

    def _declare(self, name: str) -> None:
        """Add ``name`` to the published topics, telling the controller if connected."""
        if name not in self._publishes:
            self._publishes.add(name)
            if self._controller_conn is not None and self._registered.is_set():
                self._spawn(self._send_quietly(self._controller_conn, self._registration()))

    def _drop_subscriber(self, conn: Connection, exc: TianjiError) -> None:
        if isinstance(exc, EndOfStream):  # it said goodbye: left, not lost
            self.counters["subscribers_left"] += 1
            log.info("%s: subscriber %s left", self.name, conn.peer)
        else:
            self.counters["subscribers_lost"] += 1
            log.warning("%s: subscriber %s lost: %s", self.name, conn.peer, str(exc))
        for conns in self._subscribers.values():
            conns.discard(conn)
        conn.abort()
        self._notify()

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

    async def _send_control(self, ev: Event) -> None:
        conn = self._controller_conn
        if conn is None:
            raise ServiceFailed(self.name, f"no controller link to send {ev.TYPE}")
        await conn.send(self._frames(ev, CONTROL))

    # ------------------------------------------------------------------ serving
    async def _accept_loop(self, listener: Listener | None, local: bool = False) -> None:
        """Serve every peer that connects; ``local``: the listener for this host's peers
        (they may read large events from this service's board)."""
        assert listener is not None
        while True:
            try:
                conn = await listener.accept()
            except ClosedByUs as exc:  # we closed it: the service is stopping
                log.debug("%s: listener closed: %s", self.name, exc)
                return
            except TianjiError as exc:  # no new peer reaches us from now on: say so
                self.counters["listener_failures"] += 1
                log.error("%s: listener %s failed: %s", self.name, listener.address, exc)
                return
            if local:
                self._local_peers.add(conn)
            self._spawn(self._serve_peer(conn))

    async def _serve_peer(self, conn: Connection) -> None:
        self._peers.add(conn)
        try:
            while True:
                frames = await conn.recv()
                _, ev = self._decode(frames, conn.peer)
                if isinstance(ev, Subscribe):
                    for name in ev.topics:
                        self._subscribers.setdefault(name, set()).add(conn)
                    self._notify()
                    await self.on_subscribed(conn, ev.topics)
                else:
                    await self.on_request(ev, conn)
        except BadFrame as exc:
            self.counters["bad_frames"] += 1
            log.warning("%s: closing connection from %s: %s", self.name, conn.peer, str(exc))
            conn.abort()
        except TianjiError as exc:
            log.debug("%s: peer %s gone: %s", self.name, conn.peer, str(exc))
        finally:
            self._peers.discard(conn)
            self._local_peers.discard(conn)
            for conns in self._subscribers.values():
                conns.discard(conn)
            self._notify()
            await self.on_peer_closed(conn)


def advertised(address: str, host: str | None) -> str:
    """``address`` with its host replaced by ``host`` (``tcp://0.0.0.0:5000`` advertised as
    ``tcp://10.0.0.1:5000``); unchanged when ``host`` is ``None`` or the address has no
    ``host:port`` part."""
    if not host:
        return address
    scheme, rest = plugins.split_address(address)
    _, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit():
        return address
    host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"{scheme}://{host}:{port}"


def locality() -> str:
    """Which services can share memory with this one: same host and same network
    namespace (the shm transport's rendezvous socket lives in the network namespace)."""
    try:
        netns = os.stat("/proc/self/ns/net").st_ino
    except OSError as exc:  # no /proc (not Linux): one namespace per host
        log.debug("no network namespace to tell apart: %r", exc)
        return socket.gethostname()
    return f"{socket.gethostname()}/net:{netns}"


async def _first(*aws: Coroutine[Any, Any, Any]) -> None:
    """Wait until the first of ``aws`` completes; cancel the rest."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
