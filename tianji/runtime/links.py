"""A service's subscriptions: its handlers per topic and one link per publisher address,
made, kept and retired as the controller reports who publishes what
(:class:`Subscriptions`, owned by :class:`~tianji.runtime.service.Service`)."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from tianji.runtime import plugins
from tianji.runtime.core import Connection, recv_batch
from tianji.runtime.errors import BadFrame, TianjiError
from tianji.runtime.events import BoardPosted, Event, Subscribe, Want
from tianji.runtime.heartbeats import ServiceStat
from tianji.runtime.leases import Handoff
from tianji.runtime.wiring import CONTROL, Decode, Encode, Send, ServiceOptions, Spawn

__all__ = ["Handler", "Link", "Subscriptions"]

RECV_BATCH = 64
"""At most this many messages are taken per wake-up (and at most ~1 MiB beyond the first:
see :func:`~tianji.runtime.core.recv_batch`), so the batch adds little to the link's bound."""

ZERO_COPY_MIN_BYTES = 256 << 10
"""Messages over shared memory at least this large reach handlers as views of the ring
(smaller ones are copied out: settling a lease costs about what copying 128 KiB does)."""

log = logging.getLogger("tianji.service")

E = TypeVar("E", bound=Event)
Handler = Callable[[E], Awaitable[None]]
"""What :meth:`~tianji.runtime.service.Service.subscribe` calls with each event."""
FromBoard = Callable[[BoardPosted, str], "tuple[str, Event] | None"]


class Link:
    """A subscription link to one publisher address."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.topics: set[str] = set()
        self.conn: Connection | None = None
        self.task: asyncio.Task[None] | None = None
        self.retired = False  # publisher left the registry: read to the end, do not reconnect
        self.error: str | None = None  # why the last connect failed, until one succeeds
        self.down_since: float | None = None  # monotonic time of the first failed connect
        self.ever_up = False

    def failed(self, error: str) -> None:
        """A connect failed: keep why (and since when, from the first failure on)."""
        self.error = error
        if self.down_since is None:
            self.down_since = time.monotonic()

    def up(self) -> None:
        """A connect succeeded."""
        self.error = None
        self.down_since = None
        self.ever_up = True

    def down_report(self, now: float) -> str | None:
        """``"<error> (down N s[, never up])"`` while connecting fails, else ``None``."""
        if self.error is None or self.down_since is None:
            return None
        never = "" if self.ever_up else ", never up"
        return f"{self.error} (down {now - self.down_since:.0f} s{never})"


class Subscriptions:
    """Links to the publishers of the topics a service subscribes to: one per address,
    reconnected with backoff while the publisher is registered, read to the end and dropped
    once it left; and the handlers each event of those topics goes to.

    Args:
        name: the owning service's name (for logs).
        options: the service's options (limits, reconnect delays).
        counters: the service's counters (received events, link failures, ...).
        spawn: runs a link's loop as a task of the service.
        encode, decode: a service message to and from its frames.
        send_quietly: sends a ``Subscribe`` for topics added to a live link.
        from_board: resolves a board reference into its event (``None``: superseded).
        report_soon: asks for a heartbeat now (a link that cannot connect is reported).
        stopping: whether the service is stopping (then no new links are made).
        locality: gives the service's locality, told to every publisher (one of the same
            locality sends large events through its shared-memory board).
    """

    def __init__(
        self,
        name: str,
        options: ServiceOptions,
        counters: collections.Counter[str],
        *,
        spawn: Spawn,
        encode: Encode,
        decode: Decode,
        send_quietly: Send,
        from_board: FromBoard,
        report_soon: Callable[[], None],
        stopping: Callable[[], bool],
        locality: Callable[[], str] = str,
    ) -> None:
        self.name = name
        self.locality = locality
        self.options = options
        self.counters = counters
        self.handlers: dict[str, list[Handler[Any]]] = {}
        self.links: dict[str, Link] = {}
        self.latest_only: set[str] = set()  # topics subscribed with latest_only
        self.on_demand: set[str] = set()  # topics taken on demand (tianji.runtime.demand)
        self.handoff = Handoff()  # zero-copy events over shm links (tianji.runtime.leases)
        self._spawn = spawn
        self._encode = encode
        self._decode = decode
        self._send_quietly = send_quietly
        self._from_board = from_board
        self._report_soon = report_soon
        self._stopping = stopping

    def add_handler(
        self, name: str, handler: Handler[Any], latest_only: bool, on_demand: bool = False
    ) -> bool:
        """Call ``handler`` for every event of topic ``name``; True if the topic is new."""
        if latest_only or on_demand:
            self.latest_only.add(name)
        if on_demand:
            self.on_demand.add(name)
        first = name not in self.handlers
        self.handlers.setdefault(name, []).append(handler)
        return first

    def link_to(self, address: str, topics: set[str]) -> None:
        """Subscribe to ``topics`` at the publisher ``address`` (a link made or reused)."""
        link = self.links.get(address)
        if link is None or link.retired:
            link = Link(address)
            self.links[address] = link
        new = topics - link.topics
        link.topics |= topics
        if link.task is None:
            link.task = self._spawn(self._link_loop(link))
        elif new and link.conn is not None:
            conn = link.conn
            self._spawn(self._send_quietly(conn, self._subscribe(new)))

    def links_down(self) -> dict[str, str]:
        """Publisher address -> why this service cannot connect to it (see
        :meth:`Link.down_report`), for the links failing now."""
        now = time.monotonic()
        down = {a: link.down_report(now) for a, link in self.links.items()}
        return {a: why for a, why in down.items() if why is not None}

    def set_publishers(self, name: str, addresses: Sequence[str], own: set[str]) -> None:
        """The publishers of ``name`` are now ``addresses`` (``own``: this service's own
        addresses, never linked to): link to the new ones, retire the ones that left."""
        if self._stopping():  # draining: no new links
            return
        wanted = set(addresses) - own
        for address in wanted:
            self.link_to(address, {name})
        for address, link in list(self.links.items()):
            if address not in wanted and name in link.topics:
                link.topics.discard(name)
                if not link.topics:
                    link.retired = True  # read what is still in flight, then end
                    del self.links[address]
                    if name in self.latest_only and link.conn is not None:
                        # nothing to drain: the newer events come from the new publisher
                        self._spawn(_leave(link.conn))
                        self.counters["links_left"] += 1

    async def close(self) -> None:
        """Leave every link at once (a goodbye, not a vanish), for a stopping service."""

        async def leave(link: Link) -> None:
            link.retired = True
            if link.conn is not None:
                try:
                    await asyncio.wait_for(link.conn.aclose(), 1.0)
                except (TianjiError, TimeoutError) as exc:
                    log.debug("%s: link %s closed unanswered: %r", self.name, link.conn.peer, exc)
                    link.conn.abort()  # it did not answer: do not keep its sender waiting
            if link.task is not None:
                link.task.cancel()

        # a late PublishersChanged may add one: iterate a copy
        await asyncio.gather(*(leave(link) for link in list(self.links.values())))

    def abort(self) -> None:
        """Drop every link's connection at once."""
        for link in self.links.values():
            if link.conn is not None:
                link.conn.abort()

    def queue_depths(self, depths: dict[str, int]) -> None:
        """Add each live link's received-but-unhandled messages to ``depths``."""
        for link in self.links.values():
            if link.conn is not None:
                depths[f"from:{link.address}"] = link.conn.statistics().recv_queue_messages

    def _subscribe(self, topics: set[str]) -> Subscribe:
        return Subscribe(
            topics=tuple(sorted(topics)),
            locality=self.locality(),
            on_demand=tuple(sorted(topics & self.on_demand)),
        )

    def want(self, name: str) -> None:
        """Ask every publisher of ``name`` (a topic taken on demand) for its newest event."""
        for link in self.links.values():
            if name in link.topics and link.conn is not None:
                self._spawn(self._send_quietly(link.conn, Want(topic=name)))

    async def _link_loop(self, link: Link) -> None:
        delay = self.options.reconnect_min
        transport = plugins.transport_for(link.address)
        while not link.retired:
            try:
                conn = await transport.connect(link.address, limits=self.options.limits)
            except (TianjiError, OSError) as exc:
                self._connect_failed(link, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.options.reconnect_max)
                continue
            link.up()
            link.conn = conn
            try:
                await conn.send(self._encode(self._subscribe(link.topics), CONTROL))
                delay = self.options.reconnect_min
                if hasattr(conn, "recv_lease_batch"):
                    await self._receive_leased(conn)
                while True:  # one wake-up per burst: every message ready, in order
                    for frames in await recv_batch(conn, RECV_BATCH):
                        name, ev = self._decode(frames, conn.peer)
                        await self.dispatch(name, ev, conn)
            except BadFrame as exc:
                self.counters["bad_frames"] += 1
                log.warning("%s: dropping link to %s: %s", self.name, link.address, str(exc))
            except TianjiError as exc:
                log.info("%s: link to %s ended: %s", self.name, link.address, str(exc))
            finally:
                link.conn = None
                conn.abort()
            if not link.retired:
                self.counters["link_reconnects"] += 1
                await asyncio.sleep(delay)
        link.task = None

    def _connect_failed(self, link: Link, exc: Exception) -> None:
        self.counters["link_connect_failures"] += 1
        if link.error is None:  # reported in the heartbeat (links_down) meanwhile
            log.warning("%s: cannot reach %s: %s", self.name, link.address, str(exc))
            link.failed(str(exc))
            self._report_soon()
        else:
            link.failed(str(exc))

    async def dispatch(self, name: str, ev: Event, conn: Connection) -> None:
        """Run the handlers of ``name`` on ``ev`` (resolving a board reference first)."""
        if isinstance(ev, BoardPosted):  # a large event on the publisher's board
            got = self._from_board(ev, conn.peer)
            if got is None:  # superseded; taken on demand, the newer one must be asked for
                if ev.topic in self.on_demand:
                    self._spawn(self._send_quietly(conn, Want(topic=ev.topic)))
                return
            name, ev = got
        self.counters[ServiceStat.RECEIVED] += 1
        for handler in self.handlers.get(name, ()):
            await handler(ev)

    async def _receive_leased(self, conn: Any) -> None:
        """Receive over shared memory without copying: each event's arrays view the ring
        while its handlers run; :class:`~tianji.runtime.leases.Handoff` then gives the space
        back, copies what a handler kept, or holds the lease while a kept array lives."""
        handoff = self.handoff
        poller: asyncio.Task[None] | None = None  # ends by itself once nothing is held
        while True:
            for lease in await conn.recv_lease_batch(RECV_BATCH):
                frames = lease.frames
                if sum([f.nbytes for f in frames]) < ZERO_COPY_MIN_BYTES:
                    # small: a copy costs less than tracking what handlers keep
                    frames = [memoryview(bytearray(f)) for f in frames]
                    lease.release()
                    name, ev = self._decode(frames, conn.peer)
                    await self.dispatch(name, ev, conn)
                    continue
                try:
                    name, ev = self._decode(frames, conn.peer)
                except BaseException:
                    lease.release()
                    raise
                with handoff.settled(lease, ev):
                    await self.dispatch(name, ev, conn)
                del ev
                if handoff.held_now and (poller is None or poller.done()):
                    # frees the held leases even when no further message comes
                    poller = self._spawn(_poll_holds(handoff))


async def _poll_holds(handoff: Handoff) -> None:
    """Every 50 ms, free the held leases whose arrays are gone; end when none is held."""
    while handoff.held_now:
        await asyncio.sleep(0.05)
        handoff.poll()


async def _leave(conn: Connection) -> None:
    """Close a subscription link politely (the publisher counts it as left, not lost)."""
    try:
        await asyncio.wait_for(conn.aclose(), 2.0)
    except (TianjiError, TimeoutError) as exc:  # it did not answer: gone all the same
        log.debug("%s: left unanswered: %r", conn.peer, exc)
        conn.abort()
