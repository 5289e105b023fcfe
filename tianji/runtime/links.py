"""A service's subscriptions: one link per publisher address, made, kept and retired as the
controller reports who publishes what (:class:`Subscriptions`, a mixin of
:class:`~tianji.runtime.service.Service`)."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Coroutine, Sequence
from typing import Any, Protocol

from tianji.runtime import plugins
from tianji.runtime.core import Connection, recv_batch
from tianji.runtime.errors import BadFrame, TianjiError
from tianji.runtime.events import BoardPosted, Event, Subscribe
from tianji.runtime.heartbeats import CONTROL, ServiceStat
from tianji.runtime.leases import Handoff

__all__ = ["CONTROL", "Link", "Subscriptions"]

RECV_BATCH = 64
"""At most this many messages are taken per wake-up (and at most ~1 MiB beyond the first:
see :func:`~tianji.runtime.core.recv_batch`), so the batch adds little to the link's bound."""

ZERO_COPY_MIN_BYTES = 256 << 10
"""Messages over shared memory at least this large reach handlers as views of the ring
(smaller ones are copied out: settling a lease costs about what copying 128 KiB does)."""

log = logging.getLogger("tianji.service")


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


class _Linked(Protocol):
    """What a service's subscriptions use of the service (see :class:`Service`)."""

    name: str
    address: str
    local_address: str
    options: Any
    counters: collections.Counter[str]
    _links: dict[str, Link]
    _latest_only: set[str]
    _handlers: dict[str, list[Any]]
    _stopping: asyncio.Event
    _handoff: Handoff

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]: ...

    def _frames(self, ev: Event, topic_name: str) -> list[bytes | bytearray | memoryview]: ...

    def _decode(self, frames: list[memoryview], peer: str) -> tuple[str, Event]: ...

    def _from_board(self, ev: BoardPosted, peer: str) -> tuple[str, Event] | None: ...

    async def _send_quietly(self, conn: Connection | None, ev: Event) -> None: ...

    def _link_to(self: _Linked, address: str, topics: set[str]) -> None: ...

    def report_soon(self) -> None: ...

    async def _link_loop(self: _Linked, link: Link) -> None: ...

    async def _dispatch(self: _Linked, name: str, ev: Event, conn: Connection) -> None: ...

    async def _receive_leased(self: _Linked, conn: Any) -> None: ...


class Subscriptions:
    """Links to the publishers of the topics a service subscribes to: one per address,
    reconnected with backoff while the publisher is registered, read to the end and dropped
    once it left."""

    def _link_to(self: _Linked, address: str, topics: set[str]) -> None:
        link = self._links.get(address)
        if link is None or link.retired:
            link = Link(address)
            self._links[address] = link
        new = topics - link.topics
        link.topics |= topics
        if link.task is None:
            link.task = self._spawn(self._link_loop(link))
        elif new and link.conn is not None:
            conn = link.conn
            self._spawn(self._send_quietly(conn, Subscribe(topics=tuple(sorted(new)))))

    def links_down(self: _Linked) -> dict[str, str]:
        """Publisher address -> why this service cannot connect to it (see
        :meth:`Link.down_report`), for the links failing now."""
        now = time.monotonic()
        down = {a: link.down_report(now) for a, link in self._links.items()}
        return {a: why for a, why in down.items() if why is not None}

    def _set_publishers(self: _Linked, name: str, addresses: Sequence[str]) -> None:
        if self._stopping.is_set():  # draining: no new links
            return
        wanted = set(addresses) - {self.address, self.local_address}
        for address in wanted:
            self._link_to(address, {name})
        for address, link in list(self._links.items()):
            if address not in wanted and name in link.topics:
                link.topics.discard(name)
                if not link.topics:
                    link.retired = True  # read what is still in flight, then end
                    del self._links[address]
                    if name in self._latest_only and link.conn is not None:
                        # nothing to drain: the newer events come from the new publisher
                        self._spawn(_leave(link.conn))
                        self.counters["links_left"] += 1

    async def _link_loop(self: _Linked, link: Link) -> None:
        delay = self.options.reconnect_min
        transport = plugins.transport_for(link.address)
        while not link.retired:
            try:
                conn = await transport.connect(link.address, limits=self.options.limits)
            except (TianjiError, OSError) as exc:
                self.counters["link_connect_failures"] += 1
                if link.error is None:  # reported in the heartbeat (links_down) meanwhile
                    log.warning("%s: cannot reach %s: %s", self.name, link.address, str(exc))
                    link.failed(str(exc))
                    self.report_soon()
                else:
                    link.failed(str(exc))
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.options.reconnect_max)
                continue
            link.up()
            link.conn = conn
            try:
                await conn.send(self._frames(Subscribe(topics=tuple(sorted(link.topics))), CONTROL))
                delay = self.options.reconnect_min
                if hasattr(conn, "recv_lease_batch"):
                    await self._receive_leased(conn)
                while True:  # one wake-up per burst: every message ready, in order
                    for frames in await recv_batch(conn, RECV_BATCH):
                        name, ev = self._decode(frames, conn.peer)
                        await self._dispatch(name, ev, conn)
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

    async def _dispatch(self: _Linked, name: str, ev: Event, conn: Connection) -> None:
        """Run the handlers of ``name`` on ``ev`` (resolving a board reference first)."""
        if isinstance(ev, BoardPosted):  # a large event on the publisher's board
            got = self._from_board(ev, conn.peer)
            if got is None:
                return
            name, ev = got
        self.counters[ServiceStat.RECEIVED] += 1
        for handler in self._handlers.get(name, ()):
            await handler(ev)

    async def _receive_leased(self: _Linked, conn: Any) -> None:
        """Receive over shared memory without copying: each event's arrays view the ring
        while its handlers run; :class:`~tianji.runtime.leases.Handoff` then gives the space
        back, copies what a handler kept, or holds the lease while a kept array lives."""
        handoff = self._handoff
        poller: asyncio.Task[None] | None = None  # ends by itself once nothing is held
        while True:
            for lease in await conn.recv_lease_batch(RECV_BATCH):
                frames = lease.frames
                if sum([f.nbytes for f in frames]) < ZERO_COPY_MIN_BYTES:
                    # small: a copy costs less than tracking what handlers keep
                    frames = [memoryview(bytearray(f)) for f in frames]
                    lease.release()
                    name, ev = self._decode(frames, conn.peer)
                    await self._dispatch(name, ev, conn)
                    continue
                try:
                    name, ev = self._decode(frames, conn.peer)
                except BaseException:
                    lease.release()
                    raise
                with handoff.settled(lease, ev):
                    await self._dispatch(name, ev, conn)
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
